"""rosterd: serve a model lab's roster of local LLMs across its machines.

Layers (imports only point down): ``tokens``/``errors``/``spec`` → ``roster``/``fleet``
→ ``residency``/``placement`` → ``adapters`` → ``supervisor`` → ``scheduler`` →
``router`` → ``cli``.
"""

__version__ = "0.1.0"
