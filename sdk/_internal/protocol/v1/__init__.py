"""Generated from proto/omnirt/_internal/protocol/v1; do not edit (scripts/gen_proto.py)."""
