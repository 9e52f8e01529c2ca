"""epochguard.consumer"""
