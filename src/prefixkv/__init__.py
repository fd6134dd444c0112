"""prefixkv"""
