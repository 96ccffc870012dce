"""`python -m keras_vit_cli`: the same as the `keras-vit` command."""

import sys

from keras_vit_cli import main

sys.exit(main())
