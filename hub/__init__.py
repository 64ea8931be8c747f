"""paddlejax.hub (to come)."""
