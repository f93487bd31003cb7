"""Training objectives, one module a family: ``contrastive`` (ConSERT, SimCSE, ESimCSE; NLI), ``tsdae``,
``distill``, ``promptbert``; ``base`` holds what they share and ``factory`` builds one from a config."""
