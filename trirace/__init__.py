"""trirace: hybrid pipeline x data parallel training with multidimensional communication scheduling."""

__version__ = "0.1.0"
