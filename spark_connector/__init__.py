"""epochguard.spark_connector"""
