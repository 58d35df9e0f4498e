"""Foundations: errors, batch collation, gradient ops, the plug-in registry, HTML reports."""
