"""odb_lightning.app layer."""
