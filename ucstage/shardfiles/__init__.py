"""Samples inside files: WebDataset tar shards, JSON Lines and text line
files, indexed once from a local copy (:mod:`.shardindex`) and read back by
byte range, one module per format (:mod:`.tarindex`, :mod:`.lineindex`) and
the format and stream rules they share (:mod:`.shardformat`). Core: the
standard library and numpy only, no cache and no torch; the frozen index is
:class:`ucstage.manifest.shardsamples.ShardManifest`."""
