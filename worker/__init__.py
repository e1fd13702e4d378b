"""omnirt.worker"""
