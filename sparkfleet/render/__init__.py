"""Rendering: flag dicts to argument tokens, Jinja2 templates to quoted shell and argv."""
