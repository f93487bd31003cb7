"""The model registry in MLflow: register a candidate, gate it, roll back, serialise promotions, download.

The rules (what the gate decides, what blocks a promotion) are pure functions in ``sentcl.registry.rules``; this
package does the I/O around them, in an order that leaves nothing half-done that could be promoted:

1. take the promotion lease (a queue of versions of a lease model only the gate may edit, so it spans
   machines; see ``lease.promotion_lock``);
2. finish or clean up what an earlier, interrupted run left (versions tagged ``sentcl.state=registering``;
   ``versions.finish_unfinished``);
3. register the candidate, unless a version with the same weights (sha256) exists: that one is reused;
4. point ``challenger`` at it, run the gate (it downloads and verifies the candidate and the champion against
   their registration manifests and scores both itself: ``measure``), move ``champion`` and read it back, then
   write the gate's tags;
5. mark the version ``sentcl.state=ready``, release the lease (``gate.register_and_gate``).

A kill between 3 and 5 leaves a version marked ``registering``: never promotable, deleted (or, if
``champion`` already moved to it, finished) by the next registration or gate.

- ``names``: the aliases, which registered model and experiment a registration goes to;
- ``lease``: the promotion lease (``promotion_lock``);
- ``versions``: registration under the lease, its manifest, cleanup of interrupted runs;
- ``gate``: ``register_and_gate``, ``promote``, ``rollback``: gather, decide (``sentcl.registry.verdict``), apply;
- ``measure``: the gate's own verified download and dev-set scoring of a version, on its ``Evidence``;
- ``download``: checked downloads of a registered version or an alias.
- ``gatekeeper``: `make serve`'s gate process (the only holder of the gate's account there): it judges the
  candidates model's new versions, registers its own upload of a promoted one into production, moves
  ``champion`` and, every poll, checks the champion's files;
- ``owned``: the gate's one download of a candidate and the production version made from it;
- ``champion``: the gate's check of the champion's stored files and the restore of a verified one.

This file imports nothing: import the module you need.
"""
