"""Spark beside the daemon: the settings that make a Spark job see its catalog
(``icespool spark-conf``), and a SparkSession built from them.

    conf         the Spark settings for the daemon's catalog and object store
    session      a SparkSession configured to read and write the daemon's catalog
"""
