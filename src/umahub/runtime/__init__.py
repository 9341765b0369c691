"""The runtime: a compiled model loaded and run, on TVM's Relax VM or the concurrent executor.

Nothing here imports the compiler or the hub: a board runs an exported
library with this package alone.
"""
