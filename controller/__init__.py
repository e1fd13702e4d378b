"""omnirt.controller"""
