"""api/gateway"""
