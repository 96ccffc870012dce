"""Moving tensors from a checkpoint's names to keras_vit variable paths."""


class Remap:
    """Pops source tensors into `out` under new names; whatever is left keeps its name, so
    the assignment step reports it as a tensor the model has no place for."""

    def __init__(self, tensors):
        self.source = dict(tensors)
        self.out = {}

    def move(self, src, dst, fn=None):
        if src in self.source:
            value = self.source.pop(src)
            self.out[dst] = fn(value) if fn else value

    def pop(self, src):
        return self.source.pop(src)

    def has(self, *names):
        return all(name in self.source for name in names)

    def result(self):
        return {**self.out, **self.source}
