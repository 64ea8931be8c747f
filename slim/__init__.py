"""paddlejax.slim (to come)."""
