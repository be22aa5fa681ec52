"""odb_lightning: Online Dynamic Batching for PyTorch Lightning."""

__version__ = "0.1.0"
