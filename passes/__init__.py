"""paddlejax.passes"""
