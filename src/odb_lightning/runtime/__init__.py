"""odb_lightning.runtime layer."""
