"""The Amazon SQS face of the gateway: SQS's AWS JSON 1.0 protocol on ``POST /``
(or a queue URL's path) and its Query protocol (a form, answered in XML, or
in JSON when asked), the same actions, checks and errors in each, every
action a call of the public vsqs API on the gateway's thread pool. What it
does, and where it differs from Amazon: docs/gateway.md (The Amazon SQS
face); its modules: docs/ARCHITECTURE.md.
"""
