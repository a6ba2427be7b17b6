"""Generated protobuf/gRPC code (scripts/gen_proto.py). Only edge modules import it."""
