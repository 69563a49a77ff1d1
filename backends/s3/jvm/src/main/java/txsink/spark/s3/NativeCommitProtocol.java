package txsink.spark.s3;

import java.io.IOException;
import java.io.OutputStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

import com.fasterxml.jackson.databind.ObjectMapper;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.mapreduce.JobContext;
import org.apache.hadoop.mapreduce.OutputCommitter;
import org.apache.hadoop.mapreduce.TaskAttemptContext;
import org.apache.spark.TaskContext;
import org.apache.spark.internal.io.FileCommitProtocol;
import org.apache.spark.internal.io.FileNameSpec;
import org.apache.spark.sql.execution.datasources.SQLHadoopMapReduceCommitProtocol;
import scala.Option;
import scala.collection.Iterator;
import scala.collection.immutable.Seq;

/**
 * The commit protocol of txsink's native S3 path: Spark's own Parquet writer prepares a
 * txsink S3 target's participants, and commits none of them.
 *
 * <p>Each task writes its one file through S3A's magic committer
 * ({@link MagicTaskCommitter}) as a multipart upload to the key txsink's own writer
 * would use for that task ({@code <sink>/epoch=N/part-<partition>-a<attempt>.parquet},
 * attempt = Spark's task attempt id), left pending. Job commit writes one JSON document
 * listing the committed tasks' uploads ({@code <output path>/job.json}) and completes
 * nothing; txsink's driver reads it, records the uploads as the epoch's prepared
 * participants, and completes them after its decision.
 *
 * <p>Active only for writes whose options carry {@code txsink.s3.native}, to an output
 * path {@code s3a://<bucket>/<sink folder>/_txsink/native/epoch=<N>/<job>}; any other
 * write of the session is Spark's own ({@link SQLHadoopMapReduceCommitProtocol}).
 */
public class NativeCommitProtocol extends SQLHadoopMapReduceCommitProtocol {
    private static final long serialVersionUID = 1L;

    /** Write option switching a write to this protocol's behaviour. */
    public static final String ACTIVE = "txsink.s3.native";
    static final String NATIVE_DIR = "/_txsink/native/";
    static final int FORMAT_VERSION = 1;

    private final String outputPath;
    private transient TaskFiles task;
    private transient MagicTaskCommitter magic;

    public NativeCommitProtocol(String jobId, String path, boolean dynamicPartitionOverwrite) {
        super(jobId, path, dynamicPartitionOverwrite);
        this.outputPath = path;
    }

    private static boolean active(Configuration conf) {
        return conf.getBoolean(ACTIVE, false);
    }

    /** (sink folder, relative folder of the epoch, job name) from the output path. */
    private String[] layout() {
        // The last one: the prefix may hold the same words.
        int at = outputPath.lastIndexOf(NATIVE_DIR);
        String rest = at < 0 ? "" : outputPath.substring(at + NATIVE_DIR.length());
        int slash = rest.lastIndexOf('/');
        if (at < 0 || slash <= 0 || !rest.startsWith("epoch=")) {
            throw new IllegalArgumentException("txsink: output path " + outputPath
                + " is not <sink folder>" + NATIVE_DIR + "epoch=<N>/<job>");
        }
        return new String[] {outputPath.substring(0, at), rest.substring(0, slash),
            rest.substring(slash + 1)};
    }

    @Override
    public OutputCommitter setupCommitter(TaskAttemptContext context) {
        if (!active(context.getConfiguration())) {
            return super.setupCommitter(context);
        }
        String[] where = layout();
        // The magic directory is named after the job, so txsink can tell whose it is.
        context.getConfiguration().set("fs.s3a.committer.uuid", where[2]);
        TaskContext spark = TaskContext.get();
        int partition = context.getTaskAttemptID().getTaskID().getId();
        long attempt = spark != null ? spark.taskAttemptId() : context.getTaskAttemptID().getId();
        task = new TaskFiles(partition, attempt);
        try {
            magic = new MagicTaskCommitter(new Path(where[0]), context, task);
            return magic;
        } catch (IOException e) {
            throw new IllegalStateException("txsink: cannot write " + where[0]
                + " through S3A's magic committer: " + e, e);
        }
    }

    @Override
    public String newTaskTempFile(TaskAttemptContext context, Option<String> dir,
                                  FileNameSpec spec) {
        if (task == null) {
            return super.newTaskTempFile(context, dir, spec);
        }
        if (dir.isDefined()) {
            throw new IllegalStateException("txsink: the native S3 path writes no"
                + " partitioned output (partitionBy)");
        }
        if (!task.opened.isEmpty()) {
            throw new IllegalStateException("txsink: task " + task.partition + " opened a"
                + " second file; the native S3 path writes one file per task: leave"
                + " maxRecordsPerFile at 0");
        }
        String[] where = layout();
        String name = String.format("part-%05d-a%d.parquet", task.partition, task.attempt);
        Path work = new Path(magic.getWorkPath(), where[1] + "/" + name);
        Path dest = new Path(new Path(where[0], where[1]), name);
        task.opened.add(keyOf(dest));
        return work.toString();
    }

    @Override
    public String newTaskTempFileAbsPath(TaskAttemptContext context, String absoluteDir,
                                         FileNameSpec spec) {
        if (task == null) {
            return super.newTaskTempFileAbsPath(context, absoluteDir, spec);
        }
        throw new IllegalStateException("txsink: the native S3 path writes no output to"
            + " absolute paths");
    }

    private static String keyOf(Path path) {
        String key = path.toUri().getPath();
        return key.startsWith("/") ? key.substring(1) : key;
    }

    @Override
    public FileCommitProtocol.TaskCommitMessage commitTask(TaskAttemptContext context) {
        FileCommitProtocol.TaskCommitMessage spark = super.commitTask(context);
        if (task == null) {
            return spark;
        }
        return new FileCommitProtocol.TaskCommitMessage(task);
    }

    @Override
    public void commitJob(JobContext context, Seq<FileCommitProtocol.TaskCommitMessage> commits) {
        if (!active(context.getConfiguration())) {
            super.commitJob(context, commits);
            return;
        }
        List<Map<String, Object>> files = new ArrayList<>();
        int tasks = 0;
        Iterator<FileCommitProtocol.TaskCommitMessage> it = commits.iterator();
        while (it.hasNext()) {
            TaskFiles t = (TaskFiles) it.next().obj();
            tasks++;
            if (t.rows < 0) {
                throw new IllegalStateException("txsink: task " + t.partition + " attempt "
                    + t.attempt + " reported no row count; nothing of this write is kept");
            }
            for (TaskFiles.Upload u : t.uploads) {
                Map<String, Object> f = new LinkedHashMap<>();
                f.put("partition", t.partition);
                f.put("attempt", t.attempt);
                f.put("rows", t.rows);
                f.put("bucket", u.bucket);
                f.put("key", u.key);
                f.put("upload_id", u.uploadId);
                f.put("size", u.size);
                f.put("etags", u.etags);
                files.add(f);
            }
        }
        String[] where = layout();
        Map<String, Object> doc = new LinkedHashMap<>();
        doc.put("format", "txsink-s3-native-job");
        doc.put("version", FORMAT_VERSION);
        doc.put("job", where[2]);
        doc.put("dir", where[1]);
        doc.put("tasks", tasks);
        doc.put("files", files);
        Path out = new Path(outputPath, "job.json");
        try {
            byte[] body = new ObjectMapper().writeValueAsString(doc).getBytes(StandardCharsets.UTF_8);
            FileSystem fs = out.getFileSystem(context.getConfiguration());
            try (OutputStream stream = fs.create(out, false)) {
                stream.write(body);
            }
        } catch (IOException e) {
            throw new IllegalStateException("txsink: writing " + out + " failed: " + e, e);
        }
    }

    @Override
    public void abortJob(JobContext context) {
        if (!active(context.getConfiguration())) {
            super.abortJob(context);
        }
        // Otherwise nothing: what the tasks left pending is never recorded by txsink,
        // whose orphan scan aborts it.
    }
}
