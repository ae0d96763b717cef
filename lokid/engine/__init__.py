"""Release 0.1.0's module names, for its processes still running across an upgrade.

Who runs it: the engine step (``lokid engine``) of release 0.1.0 that was loading a model
while apt installed this release. It imports these modules only once its engine answers
(to clear the attempt token, mark the start ready, keep the plan for reuse) or refuses
its command line; 0.2.0 moved them, and without these names that step lost its token's
clearing at READY. Each module here *is* the new one (``sys.modules`` points the old
name at it). Nothing of this release imports them; they go in the release after 0.2.0,
whose engine steps load what they need before the engine answers
(:func:`lokid.unit.steps._load_the_rest`).
May import: :mod:`lokid.store`, :mod:`lokid.unit`.
"""
