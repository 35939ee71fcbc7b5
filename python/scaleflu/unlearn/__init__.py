"""scaleflu.unlearn."""
