"""A plugin whose import fails."""

raise ImportError("libvendor.so: cannot open shared object file")
