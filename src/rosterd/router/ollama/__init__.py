"""Ollama's API in front of every role (DESIGN.md layer 7): ``/api/*`` as Ollama serves it.

Clients that speak Ollama (Open WebUI, Continue, the ``ollama`` Python and JS
clients) reach the roster's roles through rosterd. The shapes follow Ollama's
own API reference (``docs/api.md`` of github.com/ollama/ollama). Modules:

- ``requests``: an Ollama request as the OpenAI request it becomes (pure);
- ``answers``: the OpenAI answer (whole, or an event stream) as Ollama's JSON and
  NDJSON (pure);
- ``catalog``: ``/api/version``, ``/api/tags``, ``/api/ps``, ``/api/show`` and the
  501 of what rosterd does not do (``/api/pull``, ...);
- ``generation``: ``/api/chat``, ``/api/generate``, ``/api/embed``,
  ``/api/embeddings``: queued and loaded on demand through the OpenAI proxy, or
  passed through to an ``ollama`` role's own server;
- ``routes``: every route of the API, for ``create_app``.

The package re-exports nothing: import a name from its module.
"""
