"""ActiveMQ Classic's shared-file-system master/slave, started privately for bench/failover.py.

Two broker JVMs (the Debian ``activemq`` package's jar) point their KahaDB at one directory;
KahaDB's shared-file locker lets one of them serve and keeps the other waiting, retrying the
lock every ``lock_retry`` seconds (ActiveMQ's ``lockAcquireSleepInterval``, 10 s unless set:
the comparison uses the retry our standby uses). Each instance has its own configuration,
log and temporary directory under the bench's scratch directory and serves STOMP on its own
loopback port with every journal write synced, as in the project's other ActiveMQ runs.

The log lines a run waits for: ``is locked by another server`` (standing by), ``Connector stomp
started`` (serving STOMP).
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from lognode import LoggedNode

ACTIVEMQ_HOME = Path(os.environ.get("ACTIVEMQ_HOME", "/usr/share/activemq"))
LISTEN = re.compile(r"Connector stomp started")
STANDBY = re.compile(r"is locked by another server")
TAKEN = re.compile(r"Page File: .*Recovering|KahaDB is version")  # the first line after the lock
STARTED = re.compile(r"Apache ActiveMQ .* started")

# The broker definition: persistence on the shared directory with the shared-file locker, STOMP
# on loopback only, no JMX, no web console. Placeholders are filled per instance.
CONFIG = """<beans xmlns="http://www.springframework.org/schema/beans"
  xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"
  xsi:schemaLocation="http://www.springframework.org/schema/beans
    http://www.springframework.org/schema/beans/spring-beans.xsd
    http://activemq.apache.org/schema/core http://activemq.apache.org/schema/core/activemq-core.xsd">
  <broker xmlns="http://activemq.apache.org/schema/core" brokerName="failover-bench"
          useJmx="false" persistent="true" dataDirectory="{private}"
          schedulePeriodForDestinationPurge="0">
    <persistenceAdapter>
      <kahaDB directory="{shared}" journalDiskSyncStrategy="always">
        <locker>
          <shared-file-locker lockAcquireSleepInterval="{retry_ms}"/>
        </locker>
      </kahaDB>
    </persistenceAdapter>
    <systemUsage>
      <systemUsage>
        <memoryUsage><memoryUsage percentOfJvmHeap="70"/></memoryUsage>
        <storeUsage><storeUsage limit="20 gb"/></storeUsage>
        <tempUsage><tempUsage limit="5 gb"/></tempUsage>
      </systemUsage>
    </systemUsage>
    <transportConnectors>
      <transportConnector name="stomp" uri="stomp://127.0.0.1:{port}"/>
    </transportConnectors>
  </broker>
</beans>
"""

# The Debian package logs through log4j 1.2: everything at INFO to stdout, where we read it.
LOGGING = """log4j.rootLogger=INFO, out
log4j.appender.out=org.apache.log4j.ConsoleAppender
log4j.appender.out.layout=org.apache.log4j.PatternLayout
log4j.appender.out.layout.ConversionPattern=%p %c{1} %m%n
log4j.logger.org.springframework=WARN
log4j.logger.org.apache.xbean=WARN
"""

# Java 17 needs these modules opened for ActiveMQ 5.17's reflection.
OPENS = ("java.base/java.lang", "java.base/java.util", "java.base/java.util.concurrent",
         "java.base/java.net", "java.base/java.security")


def available() -> bool:
    return (ACTIVEMQ_HOME / "bin" / "activemq.jar").is_file() and shutil.which("java") is not None


class AmqNode(LoggedNode):
    """One ActiveMQ JVM of the pair: its own base directory, the shared KahaDB directory,
    a STOMP port."""

    def __init__(self, shared: Path, base: Path, port: int, lock_retry: float,
                 heap: str = "1g") -> None:
        super().__init__(f"stomp://127.0.0.1:{port}")
        self.shared = shared
        self.base = base
        self.port = port
        self.lock_retry = lock_retry
        self.heap = heap

    def start(self) -> None:
        conf = self.base / "conf"
        for sub in (conf, self.base / "data", self.base / "tmp"):
            sub.mkdir(parents=True, exist_ok=True)
        (conf / "activemq.xml").write_text(CONFIG.format(
            private=self.base / "data", shared=self.shared, port=self.port,
            retry_ms=int(self.lock_retry * 1000)))
        (conf / "log4j.properties").write_text(LOGGING)
        self.spawn(["java", f"-Xms{self.heap}", f"-Xmx{self.heap}", "-XX:+UseG1GC",
                    *(arg for module in OPENS for arg in ("--add-opens", f"{module}=ALL-UNNAMED")),
                    f"-Dactivemq.home={ACTIVEMQ_HOME}", f"-Dactivemq.base={self.base}",
                    f"-Dactivemq.conf={conf}", f"-Dactivemq.data={self.base / 'data'}",
                    f"-Dactivemq.classpath={conf}", f"-Djava.io.tmpdir={self.base / 'tmp'}",
                    f"-Dlog4j.configuration=file:{conf / 'log4j.properties'}",
                    "-jar", str(ACTIVEMQ_HOME / "bin" / "activemq.jar"), "start",
                    f"xbean:file:{conf / 'activemq.xml'}"], cwd=self.base)
