"""The memory warm-up: worst-case step shapes, their probe and report."""
