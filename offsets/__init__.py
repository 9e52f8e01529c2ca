"""epochguard.offsets"""
