"""api/cli"""
