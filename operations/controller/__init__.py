"""The controller side: the pyinfra steps the public operations compose (runs where pyinfra runs).

``remote`` runs a host program over pyinfra's connector; ``transition`` stops, idles, uploads, launches and
verifies a server; ``readiness`` and ``waiting`` are tenacity-retried reads with progress lines; ``lease`` is the
host lock; ``supervisors`` is systemd or the plain process supervisor; ``idle_converge`` drives ``gpu.idle``;
``summary`` and ``output`` print verdicts; ``interrupt`` handles Ctrl-C.
"""
