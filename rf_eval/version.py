"""rf-eval's version, in a module of its own: the files it writes record it (map files, RaReCache maps, lm-eval
model info) without importing the package root, which re-exports the methods and so sits above them."""

__version__ = "0.1.0"
