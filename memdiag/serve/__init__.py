"""``memdiag serve``: the live view (:mod:`memdiag.serve.app`) and its pages
(:mod:`memdiag.serve.pages`)."""
