"""prefixkv.proofs"""
