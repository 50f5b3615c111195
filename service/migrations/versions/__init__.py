"""Revision scripts, one per schema version (a package, so setuptools ships them with `service`)."""
