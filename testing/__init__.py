"""epochguard.testing"""
