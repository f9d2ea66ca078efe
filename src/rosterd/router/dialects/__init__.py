"""The request dialects besides OpenAI's chat (DESIGN.md layer 7): Anthropic Messages and
OpenAI Responses, their error envelopes, and their translation to chat completions for a
backend that does not serve them natively.

- ``envelope``: how an error answer looks on a path (OpenAI's or Anthropic's shape);
- ``anthropic``: Messages requests and answers <-> chat completions, streams included;
- ``responses``: Responses requests and answers <-> chat completions, streams included;
- ``translated``: forwarding a dialect's request to a backend's ``/v1/chat/completions``
  and its answer back;
- ``paths``: which dialect paths a role's backend serves itself, the 400 or 501 before
  any load, and the translated forward for the others.

Which dialects a role's backend serves natively is its adapter's ``dialects_for`` its
weights (``RoleRoute.native``: llama-server reranks only a reranker); the proxy
translates only for the others.
"""
