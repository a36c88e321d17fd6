"""plugins/passwd: hashes, the file, the CLI and end-to-end with a real broker."""
