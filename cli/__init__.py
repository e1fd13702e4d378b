"""omnirt.cli"""
