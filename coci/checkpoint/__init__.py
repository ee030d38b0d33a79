"""Taking and loading checkpoints: the state tree, the snapshot into reused host buffers, the
background persist with its crash-safe commit, and the readers that verify before they load."""
