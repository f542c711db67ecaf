"""Result files: their schema, and the writer of a run folder with its metadata."""
