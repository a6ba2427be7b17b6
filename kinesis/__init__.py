"""The Kinesis Data Streams API (2013-12-02) over the engine: every node answers it on an
HTTP port beside its gRPC ports, so that boto3, the AWS CLI and the other AWS SDKs work
against a cluster by changing only their endpoint URL and credentials (docs/kinesis.md).

It is a translation layer over the same roles, not a second engine:
- `sigv4`: AWS Signature Version 4, verified against an SMS key's secret access key;
"""
