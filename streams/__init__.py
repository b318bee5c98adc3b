"""The stream processor: the Faust app (``streams.app``), its agents, and the pure rules
they call (``streams.followup``, ``streams.processor``)."""
