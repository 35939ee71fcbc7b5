"""scaleflu.link."""
