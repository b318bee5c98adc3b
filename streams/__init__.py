"""The stream processor: the Faust app (``memdiag.streams.app``), its agents, and the pure rules
they call (``memdiag.streams.rules.followup``, ``memdiag.streams.stages.sessions``)."""
