"""key_broker"""
