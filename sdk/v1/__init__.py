"""Generated from proto/omnirt/v1; do not edit (scripts/gen_proto.py)."""
