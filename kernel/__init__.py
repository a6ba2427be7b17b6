"""What only servers use, and no client needs (docs/architecture.md, "Layout"): the ports
between co-located roles, rate limits and tenant shares, retention, asyncio tools,
Prometheus metrics, the server's half of the gRPC edge (handler wrappers, `NodeChannels`),
encryption at rest and the audit log. Server packages import it; `sms` (the client) never
does, so an application that imports the client loads none of it.
"""
