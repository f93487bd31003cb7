"""One module per DVC stage: read params.yaml, do the file I/O, log, call sentcl."""
