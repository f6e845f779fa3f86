"""One real local SparkSession (local[2]) for all Spark specs, with our data source registered.

The session is created lazily (only when a Spark spec runs) and shared: starting one costs
~6-12 s and the first query through a Python data source another ~10 s. Task retries are on
(`local[2,3]`: two threads, a task may fail twice) so a spec can force one.

Under pytest-xdist (`make test`) every spec using this session is in the xdist group "spark",
so one worker runs them all on one JVM (~1 GB); specs that start Spark driver processes of
their own are in the group "spark-drivers" (marked in their modules), one JVM at a time.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest
from spark_settings import spark_conf

SESSION_GROUP = "spark"
DRIVERS_GROUP = "spark-drivers"


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups from the marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group(SESSION_GROUP))


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    from pyspark.sql import SparkSession

    from sluicemq.spark import SluiceDataSource

    tmp = tmp_path_factory.mktemp("spark")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    builder = SparkSession.builder.master("local[2,3]").appName("sluice-tests")
    for key, value in spark_conf(tmp).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(SluiceDataSource)
    yield session
    session.stop()
