"""The online HTTP gateway: in the scheduler's process (`shoal serve`, ``--shoal-gateway-port``) or its own (`shoal gateway`).

Imported only where a gateway starts (it loads aiohttp): a batch job's
scheduler never imports it. `app.Gateway` is the aiohttp application, `link`
how it reaches the queue; the other modules are the steps of a request
(`wire` decoding, `api_formats` shapes, `request_parts` large requests,
`token_arrays` OpenAI's token ids, `auth`, `metrics`).
"""
