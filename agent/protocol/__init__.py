"""The wire between deployctl and its host agent, split by what it carries: requests.py (the Request in,
JSON), events.py (the Events out, JSON lines, and the outcome), answers.py (what the read-only verbs
answer); common.py holds the words both sides check. Stdlib only: it runs on the GPU server from the
agent bundle. Import a name from the module that carries it; the names below stay for older imports.
"""

from agent.protocol.answers import (
    BackupRow as BackupRow,
)
from agent.protocol.answers import (
    BackupsAnswer as BackupsAnswer,
)
from agent.protocol.answers import (
    DropInData as DropInData,
)
from agent.protocol.answers import (
    FactsDoc as FactsDoc,
)
from agent.protocol.answers import (
    GpuCard as GpuCard,
)
from agent.protocol.answers import (
    GpuRow as GpuRow,
)
from agent.protocol.answers import (
    HistoryEntry as HistoryEntry,
)
from agent.protocol.answers import (
    Holder as Holder,
)
from agent.protocol.answers import (
    HomeData as HomeData,
)
from agent.protocol.answers import (
    HostFacts as HostFacts,
)
from agent.protocol.answers import (
    InspectAnswer as InspectAnswer,
)
from agent.protocol.answers import (
    InspectedUnit as InspectedUnit,
)
from agent.protocol.answers import (
    ModelFact as ModelFact,
)
from agent.protocol.answers import (
    SignalAnswer as SignalAnswer,
)
from agent.protocol.answers import (
    StatusAnswer as StatusAnswer,
)
from agent.protocol.answers import (
    TxnStatus as TxnStatus,
)
from agent.protocol.answers import (
    UnitStateData as UnitStateData,
)
from agent.protocol.answers import (
    UnitView as UnitView,
)
from agent.protocol.answers import (
    as_facts as as_facts,
)
from agent.protocol.common import (
    BACKUP_NAME as BACKUP_NAME,
)
from agent.protocol.common import (
    CONTROL as CONTROL,
)
from agent.protocol.common import (
    HTTP_URL as HTTP_URL,
)
from agent.protocol.common import (
    SECRET_CREDENTIAL as SECRET_CREDENTIAL,
)
from agent.protocol.common import (
    SURROGATE as SURROGATE,
)
from agent.protocol.common import (
    TXN_ID as TXN_ID,
)
from agent.protocol.common import (
    UNIT_NAME as UNIT_NAME,
)
from agent.protocol.common import (
    UNPRINTABLE as UNPRINTABLE,
)
from agent.protocol.common import (
    VERSION as VERSION,
)
from agent.protocol.common import (
    ProtocolError as ProtocolError,
)
from agent.protocol.common import (
    find_control as find_control,
)
from agent.protocol.common import (
    new_txn_id as new_txn_id,
)
from agent.protocol.common import (
    secret_path as secret_path,
)
from agent.protocol.common import (
    unit_sha256 as unit_sha256,
)
from agent.protocol.events import (
    DOWNTIME_PHASES as DOWNTIME_PHASES,
)
from agent.protocol.events import (
    OUTCOMES as OUTCOMES,
)
from agent.protocol.events import (
    DowntimeData as DowntimeData,
)
from agent.protocol.events import (
    DrainData as DrainData,
)
from agent.protocol.events import (
    Event as Event,
)
from agent.protocol.events import (
    EventJson as EventJson,
)
from agent.protocol.events import (
    LoadData as LoadData,
)
from agent.protocol.events import (
    Outcome as Outcome,
)
from agent.protocol.events import (
    OutcomeData as OutcomeData,
)
from agent.protocol.events import (
    PrewarmData as PrewarmData,
)
from agent.protocol.events import (
    RouterData as RouterData,
)
from agent.protocol.events import (
    SmokeData as SmokeData,
)
from agent.protocol.events import (
    Stage as Stage,
)
from agent.protocol.events import (
    exit_code as exit_code,
)
from agent.protocol.requests import (
    ANSWER_TIMEOUT_S as ANSWER_TIMEOUT_S,
)
from agent.protocol.requests import (
    RESTART_JOB_TIMEOUT_S as RESTART_JOB_TIMEOUT_S,
)
from agent.protocol.requests import (
    SIGNALS as SIGNALS,
)
from agent.protocol.requests import (
    SLACK_S as SLACK_S,
)
from agent.protocol.requests import (
    VERBS as VERBS,
)
from agent.protocol.requests import (
    Group as Group,
)
from agent.protocol.requests import (
    Request as Request,
)
from agent.protocol.requests import (
    Smoke as Smoke,
)
from agent.protocol.requests import (
    Timeouts as Timeouts,
)
from agent.protocol.requests import (
    conversation_bound_s as conversation_bound_s,
)
