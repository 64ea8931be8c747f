"""paddlejax.models (to come)."""
