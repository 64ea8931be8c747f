"""The ``paddlejax`` command line; one module per command."""
