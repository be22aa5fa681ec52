"""odb_lightning.lit layer."""
